"""pagesim.sim: the virtual-time driver.

`specs` holds the model and GPU catalog (and reads Hugging Face config.json models) and sizes the
KV pool the way the paper does; `cost` turns one iteration's batch shape into seconds (calibrated,
roofline, constant, profiled). Both are pure Python. The SimPy engine lives in its own module, so
importing this package stays cheap and never pulls in simpy.
"""
