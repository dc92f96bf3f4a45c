"""The paper's figures, one script each (figNN_<name>.py, run by run_all.py / `pagesim figures`),
the paper's numbers (paper.py) and the GPU check (gpu_check.py)."""
