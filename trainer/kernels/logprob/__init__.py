"""Per-token log-prob and entropy of the temperature-scaled softmax: reference, chunked, Pallas, fused LM head."""
