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


@pytest.fixture
def refused_in_one_line():
    """check(path, field, words): loading the config at path fails with one line naming the file
    and the field, and saying `words`."""
    from pagesim.models import ModelConfigError, get_model

    def check(path: Path, field: str, words: str) -> None:
        with pytest.raises(ModelConfigError) as e:
            get_model(str(path))
        message = str(e.value)
        assert str(path) in message and repr(field) in message and words in message, message
        assert "\n" not in message

    return check
