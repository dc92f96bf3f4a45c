import os

# The Triton interpreter must be chosen before any @triton.jit function is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch's OpenMP threads spin when the two cores are shared (measured here: a tiny-model step
# 40x slower); the tests' shapes are small, one thread is the fast choice.
os.environ.setdefault("OMP_NUM_THREADS", "1")
