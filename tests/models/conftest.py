import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The real runs' model configs (../shared/data/real_vllm/model_configs, or $PAGESIM_DATA_DIR/...).
MODEL_CONFIGS = Path(os.environ.get("PAGESIM_DATA_DIR", ROOT.parent / "shared" / "data")) / "real_vllm" / "model_configs"


@pytest.fixture
def shared_config():
    """The path of a shared real-run model's config.json; skips the test where it is absent."""

    def path_of(name: str) -> Path:
        path = MODEL_CONFIGS / name / "config.json"
        if not path.exists():
            pytest.skip(f"needs {path} (the shared real-run model configs; set PAGESIM_DATA_DIR)")
        return path

    return path_of
