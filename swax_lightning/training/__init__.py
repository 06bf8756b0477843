"""The training layer: the LightningModule, the window Callback, checkpoints and run folders, the numerics guard,
token throughput and FLOPs, the distributed strategies (FSDP2, DDP) and the rank watchdog."""
