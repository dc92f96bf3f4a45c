"""pagesim.sim: the virtual-time driver.

`specs` holds the model and GPU catalog and sizes the KV pool the way the paper does;
`cost_model` turns one iteration's batch shape into seconds (roofline, constant, later profiled).
Both are pure Python. The SimPy engine lives in its own module, so importing this package stays
cheap and never pulls in simpy.
"""
