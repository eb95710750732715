"""tsm_ds: DeepSpeed-driven large-batch training of the Temporal Shift Module (TSM)."""
from setuptools import find_packages, setup

# Pins are what was measured (../shared/ds_cpu_notes.md): DeepSpeed changed defaults within 0.19.x
# (gradient_clipping 1.0 since 0.19.3, 1-bit optimizers removed in 0.19.7); torch/torchvision are
# the wheels on this machine's disk (a newer torch would download several GB).
INSTALL_REQUIRES = [
    "torch==2.14.1",
    "torchvision==0.29.1",
    "deepspeed==0.19.8",
    "av>=14",
    "simplejpeg==1.9.0",   # JPEG decoding of packs (libjpeg-turbo; DCT-scaled decoding)
    "numpy",
    "tensorboard",
    "tqdm",
    "timm",          # LAMB / LARS client optimizers (FusedLamb is CUDA-only)
    "matplotlib",    # benchmark plots, confusion matrices
]

setup(
    name="tsm_ds",
    version="0.1.0",
    description="Temporal Shift Module training with DeepSpeed: models, PyAV loader, engine, benchmarks",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # ds_configs/ stays at the top of the repository (the design) and is installed inside the
    # package as tsm_ds/ds_configs, so a non-editable install keeps the recipes
    # (tsm_ds.engine.config.recipes.resolve_recipe finds them by name: --deepspeed_config cpu_fp32)
    packages=find_packages(include=["tsm_ds", "tsm_ds.*"]) + ["tsm_ds.ds_configs"],
    package_dir={"tsm_ds.ds_configs": "ds_configs"},
    package_data={"tsm_ds.ds_configs": ["*.json"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # ruff: the linter tests/test_lint.py runs (ruff.toml), pinned so that a new release's rules do not fail CI
        "test": ["pytest>=8", "ruff==0.17.6"],
        # other video decoders, compared side by side in `tsm-ds bench data` (torchcodec also needs
        # FFmpeg shared libraries from the system: apt-get install libavcodec59 libavformat59 ...)
        "bench": ["torchcodec", "decord"],
        "export": ["onnx", "onnxscript", "onnxruntime"],
        # shards (issue 30): litdata writes and reads them (local or S3); moto's server is the
        # S3-compatible server of the tests (README "Shards")
        "shards": ["litdata==0.2.76", "boto3==1.44.8", "moto[server]==5.2.5"],
    },
    entry_points={"console_scripts": ["tsm-ds=tsm_ds.cli:run"]},
)
