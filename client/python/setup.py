"""Generates the posenc.v1 stubs into the package at build time.

The stubs live under posenc._proto (posenc/_proto/posenc/v1/posenc_pb2.py),
never at the top level, so nothing the package installs shadows another
distribution's modules (grpcio's own grpc.health, say). The .proto comes from
the repository's proto/ (two levels up: pip builds a local directory in
place) or, in an sdist, from the copy the sdist command put beside this file.
"""

import pathlib
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

        # Staged as posenc/_proto/posenc/v1/posenc.proto so the generated
        # imports read "from posenc._proto.posenc.v1 import posenc_pb2".
        stage = HERE / "build" / "proto-stage"
        target = stage / "posenc" / "_proto" / PROTO
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, target)
        out = pathlib.Path(self.build_lib)
        well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
        args = ["protoc", f"-I{stage}", f"-I{well_known}", f"--python_out={out}",
                f"--pyi_out={out}", f"--grpc_python_out={out}",
                str(pathlib.Path("posenc") / "_proto" / PROTO)]
        if protoc.main(args) != 0:
            sys.exit("posenc: protoc failed on " + str(target))
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
