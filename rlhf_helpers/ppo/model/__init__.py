"""The shared-LoRA model: one base, the policy / value / reward adapters, the
fused LoRA products, the decoders and the sampler that draws responses from it.
"""
