"""The KV-cache and VRAM arithmetic (:mod:`.arithmetic`): vLLM's paged KV cache with TP and fp8,
llama.cpp layer offload. Pure functions; imports nothing else of kvgate but the profile's types.
"""
