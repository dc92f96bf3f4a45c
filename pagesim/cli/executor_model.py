"""What `run`, `profile` and `compare` share before the executor works: checking --device and
--dtype, and loading --model, every problem said in one line (exit 2)."""

from __future__ import annotations

import os

import typer

from pagesim.cli.checks import fail

DTYPES = ("float32", "float16", "bfloat16")


def dtype_name(value):
    """Parser for --dtype."""
    if value is not None and value not in DTYPES:
        raise typer.BadParameter(f"must be one of {', '.join(DTYPES)}, got {value!r}")
    return value


def check_device(name: str) -> None:
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        fail(f"--device {name!r}: expected cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail(f"--device {name}: no CUDA device is available here (torch {torch.__version__}"
                 f"{', built without CUDA' if torch.version.cuda is None else ''}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            fail(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        fail(f"--device {name!r}: expected cpu, cuda or cuda:N")


def load_executor_model(spec: str, device: str, dtype: str | None, console, one_thread: bool = False,
                        tokenizer: bool = False):
    """The executor's LoadedModel for --model, under a spinner. one_thread pins torch to one CPU
    thread first (profiles measure with one, so runs compared against them do too); tokenizer
    loads the model's tokenizer too (a server reads and writes text)."""
    with console.status(f"loading {spec}", spinner="dots"):
        try:
            import torch
            import transformers
        except ImportError as e:
            fail(f"this command runs the executor, which needs {e.name}: pip install 'pagesim[executor]'")
        transformers.utils.logging.disable_progress_bar()  # our spinner says what is happening
        from executor.models.loader import ModelLoadError, load_model

        check_device(device)
        if one_thread and device == "cpu":
            torch.set_num_threads(1)
        try:
            return load_model(spec, dtype=getattr(torch, dtype) if dtype else None, device=device, tokenizer=tokenizer)
        except ModelLoadError as e:
            fail(f"--model {spec}: {e}")


def check_length(lm, max_model_len: int | None, model: str) -> None:
    """--max-model-len against the model: past a learned position table (OPT) refused outright (the
    table ends there); past a rotary model's length refused as vLLM refuses it, unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (pagesim.models.max_len)."""
    from pagesim.models.max_len import check_max_model_len

    table = getattr(lm.model, "position_limit", None)
    if max_model_len is not None and table is not None and max_model_len > table:
        fail(f"--max-model-len {max_model_len} exceeds {model}'s table of {table} learned positions")
    try:
        check_max_model_len(max_model_len, lm.max_model_len, model)
    except ValueError as e:
        fail(str(e))


def check_cache_fits(lm, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, paged: bool = False) -> None:
    """Refuse KV pools larger than the memory free for them, before allocating (a typo in
    --num-gpu-blocks would otherwise take the machine's memory, or fail deep inside torch).
    Sized as the engine allocates them (its KV layout: MLA's one latent tensor, a hybrid model's
    shared layer tensors where paged); paged=False sizes for the reservation baselines, which
    keep every layer's tensor (the larger of the two)."""
    import torch

    from executor.cache_engine import model_pool_bytes

    def need(num_blocks: int) -> int:
        return model_pool_bytes(lm, block_size, num_blocks, paged)

    host_free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    pools = [("--num-cpu-blocks", num_cpu_blocks, need(num_cpu_blocks), host_free, "host memory")]
    if lm.device.type == "cuda":
        pools.append(("--num-gpu-blocks", num_gpu_blocks, need(num_gpu_blocks), torch.cuda.mem_get_info(lm.device)[0],
                      "GPU memory"))
    else:  # both pools live in host memory
        pools = [("--num-gpu-blocks + --num-cpu-blocks", num_gpu_blocks + num_cpu_blocks,
                  need(num_gpu_blocks + num_cpu_blocks), host_free, "host memory")]
    for flags, blocks, wanted, free, where in pools:
        if wanted > free:
            fail(f"{flags}: {blocks:,} blocks of {block_size} tokens need {wanted / 2**30:,.1f} GiB of KV cache, "
                 f"more than the {free / 2**30:,.1f} GiB of {where} free")


# The executor clock's noise control (executor.noise.NoiseControl), one set of flags for `run`,
# `profile` and `compare`, so that a profile and the runs compared against it are measured alike.
PIN_CPU_OPTION = typer.Option(None, "--pin-cpu", help="bind the executor to this CPU (os.sched_setaffinity; default: "
                              "leave the affinity alone)", min=0)
WARMUP_STEPS_OPTION = typer.Option(4, "--warmup-steps", help="untimed engine steps before anything is measured", min=0)
GC_DURING_STEPS_OPTION = typer.Option(False, "--gc-during-steps/--no-gc-during-steps",
                                      help="let Python's garbage collector run inside timed steps (default: it waits "
                                      "until a step is over)")


def noise_settings(pin_cpu: int | None, warmup_steps: int, gc_during_steps: bool) -> dict:
    """The flags above as NoiseControl / RunConfig fields, checked (a CPU this process may not use fails here)."""
    if pin_cpu is not None and pin_cpu not in os.sched_getaffinity(0):
        fail(f"--pin-cpu {pin_cpu}: this process may run on CPUs {sorted(os.sched_getaffinity(0))} only")
    return {"pin_cpu": pin_cpu, "warmup_steps": warmup_steps, "gc_during_steps": gc_during_steps}
