"""Helpers the tests share: paths to the shared corpus, small corpora and configs,
loopback servers (web, Ollama, Qdrant), the crash harness. Test modules import from
here, never from each other."""
