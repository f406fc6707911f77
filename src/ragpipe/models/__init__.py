"""The models: embedders (sentence-transformers, ONNX, Ollama), LLMs (llama.cpp,
Ollama) and the Ollama API client."""
