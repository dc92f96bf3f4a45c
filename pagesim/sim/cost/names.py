"""The cost models' and engine profiles' names and defaults, apart from the models themselves, so
a command's options and help can name them without loading any cost model."""

DEFAULT_COST_MODEL = "calibrated"  # used wherever a command does not name one (see registry)
PAPER_ENGINE = "paper"
DEFAULT_ENGINE = "vllm-0.19"  # the newest vLLM profile shipped
ENGINE_NAMES = ("vllm-0.19", "vllm-0.15", PAPER_ENGINE)
