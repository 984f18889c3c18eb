"""cactus-gguf: Cactus speculative decoding (Hao & Mou, ICLR 2026) over llama.cpp."""
