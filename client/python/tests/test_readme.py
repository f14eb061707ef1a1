"""The README's "Python client" examples run as written, against the test
server (their target replaced), and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import re

from conftest import ROOT


def examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python client", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_examples_run(server):
    blocks = examples()
    assert len(blocks) == 2, "the README's Python client section lost its examples"
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block.replace("localhost:50051", server.target), "README.md", "exec"),
                 namespace)
    printed = out.getvalue()
    print(printed)
    assert "bfloat16 (1, 16, 8, 128)" in printed
    assert "(1, 8, 4, 16) [0.5, 0.25]" in printed
    assert "INVALID_ARGUMENT rotary_dim must be" in printed
    assert "2 None" in printed
