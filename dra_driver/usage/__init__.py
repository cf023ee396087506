"""Who uses the GPUs: per-claim, per-pod usage sampled off the event loop and exported as metrics."""
