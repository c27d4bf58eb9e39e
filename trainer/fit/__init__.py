"""Will a config fit its TPU? Ahead-of-time compiles of every program a step runs, on a machine without a TPU.

`python -m trainer.fit --config NAME [--accelerator v6e-8] [--json]` (tpuops fit calls it): libtpu compiles
for a JAX topology of the target (jax.experimental.topologies), with the trainer's own model, meshes and
shardings, and the compiled programs give per-device memory, FLOPs, HBM bytes and collectives (docs/fit.md).
Exit codes: 0 fits with >= 10% headroom in every phase, 3 does not fit, 2 bad config, 4 libtpu missing.
"""
