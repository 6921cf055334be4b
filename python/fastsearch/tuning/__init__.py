"""The tuning loop: ``tune`` over a model's tasks, the task scheduler, progress lines and the
fusion search that tunes groupings FuseOps' rules never make."""
