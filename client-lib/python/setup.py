"""pip install for `import podlink` (from the repository, offline, with Debian's setuptools):

    pip install --no-build-isolation ./client-lib/python

It configures and builds the project's CMake target podlink_python (in build-python/ at the repository root, or
in $PODLINK_BUILD_DIR when that names an existing build) and packages the module with libpodlink.so.0 beside it
(the module finds it through its $ORIGIN run path). libpodlink's own dependencies (gRPC, protobuf, Abseil) are
the system's, as for every podlink binary.
"""
import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class BuildWithCMake(build_py):
    def run(self):
        build = os.environ.get("PODLINK_BUILD_DIR") or os.path.join(ROOT, "build-python")
        build = os.path.abspath(build if os.path.isabs(build) else os.path.join(ROOT, build))
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DPODLINK_BUILD_TESTS=OFF"])
        subprocess.check_call(["cmake", "--build", build, "--target", "podlink_python", "-j",
                               str(os.cpu_count() or 1)])
        super().run()
        out = os.path.join(self.build_lib, "podlink")
        os.makedirs(out, exist_ok=True)
        for so in glob.glob(os.path.join(build, "python", "podlink", "_podlink*.so")):
            shutil.copy2(so, out)
        lib = os.path.realpath(os.path.join(build, "client-lib", "libpodlink.so.0"))
        shutil.copy2(lib, os.path.join(out, "libpodlink.so.0"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(
    name="podlink",
    version="0.1.0",
    description="One-sided GPU and host memory transfers between Kubernetes pods through podlinkd",
    packages=["podlink"],
    package_data={"podlink": ["__init__.pyi", "py.typed"]},
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithCMake},
    distclass=BinaryDistribution,
    zip_safe=False,
)
