"""Stable Diffusion pipelines: model folder -> tokenizer and text encoders -> UNet with a sampler -> VAE -> image."""
