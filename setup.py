"""beam_dp: continual differentially private statistics and models on Apache Beam."""

from setuptools import find_packages, setup

setup(
    name="beam_dp",
    version="0.1.0",
    description="Continual differentially private releases from unbounded streams, as Apache Beam transforms",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["beam_dp", "beam_dp.*", "pipelines", "pipelines.*"]),
    # Everything the README shows after `make demo` runs on the base install (README "Dependencies and
    # why"): [yaml] for the YAML templates, scikit-learn for the jobs' bundled demo datasets,
    # matplotlib for `python -m beam_dp.report`. Only torch (lifelong, ~2 GB) stays optional.
    install_requires=[
        "apache-beam[yaml]>=2.60,<3",
        "numpy>=1.24,<2.5",
        "scipy>=1.10",
        "pyarrow>=14,<26",
        "dp-accounting>=0.4",
        "scikit-learn>=1.3",
        "matplotlib>=3.7",
    ],
    extras_require={
        "torch": ["torch==2.13.0"],
        "gcp": ["apache-beam[gcp]>=2.60,<3", "google-cloud-secret-manager>=2.16"],  # Dataflow, gs://, Secret Manager keys
        "test": ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6", "ruff>=0.15", "mypy>=1.10"],  # ruff, mypy: make lint
    },
    entry_points={"console_scripts": ["beam-dp-continual-stats=pipelines.continual_stats:main",
                                      "beam-dp-report=beam_dp.report.__main__:main"]},
)
