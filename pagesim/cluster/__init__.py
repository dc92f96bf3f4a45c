"""Clusters: replicas of the unchanged engine core on one clock, a router in front (routers/),
prefill/decode disaggregation and autoscaling. The routers decide from what a real router can see
(pagesim.cluster.routers.base.ReplicaLoad), so the same objects run in the simulator and behind
`pagesim route` in front of real servers."""
