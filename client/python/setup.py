"""Generates the posenc.v1 stubs into the package at build time.

The stubs live under posenc._proto (posenc/_proto/posenc/v1/posenc_pb2.py),
never at the top level, so nothing the package installs shadows another
distribution's modules (grpcio's own grpc.health, say). The .proto comes from
the repository's proto/ (two levels up: pip builds a local directory in
place) or, in an sdist, from the copy the sdist command put beside this file.
"""

import pathlib
import re
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
PROTO = pathlib.Path("posenc") / "v1" / "posenc.proto"


def proto_root() -> pathlib.Path:
    for root in (HERE / "proto", HERE.parent.parent / "proto"):
        if (root / PROTO).is_file():
            return root
    sys.exit(f"posenc: {PROTO} not found under {HERE / 'proto'} or {HERE.parent.parent / 'proto'}")


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)
        import grpc_tools

        # Compiled under its own name, posenc/v1/posenc.proto (the name the
        # server's reflection gives, so a caller's own copy of the same file
        # registers without a clash), then moved under posenc._proto with
        # the one import of the generated service module rewritten.
        stage = HERE / "build" / "proto-out"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
        args = ["protoc", f"-I{proto_root()}", f"-I{well_known}", f"--python_out={stage}",
                f"--pyi_out={stage}", f"--grpc_python_out={stage}", str(PROTO)]
        if protoc.main(args) != 0:
            sys.exit(f"posenc: protoc failed on {proto_root() / PROTO}")
        out = pathlib.Path(self.build_lib)
        dest = out / "posenc" / "_proto" / "posenc" / "v1"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("posenc_pb2.py", "posenc_pb2.pyi", "posenc_pb2_grpc.py"):
            text = (stage / "posenc" / "v1" / name).read_text()
            if name == "posenc_pb2_grpc.py":
                text, n = re.subn(r"^from posenc\.v1 import posenc_pb2 ",
                                  "from posenc._proto.posenc.v1 import posenc_pb2 ", text,
                                  flags=re.M)
                if n != 1:
                    sys.exit(f"posenc: expected one import of posenc_pb2 in {name}; found {n}")
            (dest / name).write_text(text)
        for pkg in ("posenc/_proto", "posenc/_proto/posenc", "posenc/_proto/posenc/v1"):
            init = out / pkg / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated from proto/ at build time."""\n')


class SdistWithProto(sdist):
    """Puts the .proto into the sdist, which is built without the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dest = pathlib.Path(base_dir) / "proto" / PROTO
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, dest)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})
