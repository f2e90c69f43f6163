"""Where the packages come from; everything else about the project is in pyproject.toml.

One import name, `bashfleet`, for the repository's two top-level folders: worker/ installs
as `bashfleet.worker` and client/ as `bashfleet.client` (setuptools' package-dir mapping;
`bashfleet` itself is a namespace package). The folders stay where the design card puts
them, and site-packages gets one name that a user's own client.py or worker.py cannot
shadow. This file exists because pyproject.toml's `packages.find` cannot add the prefix:
every subpackage of the two folders is found here (never a hand-kept list: a missing
subpackage once shipped a wheel without its dialects).
"""

from setuptools import find_packages, setup

TOP_LEVEL = ("worker", "client")

setup(
    packages=[f"bashfleet.{name}"
              for name in find_packages(include=[*TOP_LEVEL, *(f"{top}.*" for top in TOP_LEVEL)])],
    package_dir={f"bashfleet.{top}": top for top in TOP_LEVEL},
)
