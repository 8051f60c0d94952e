"""Engine fixtures.

The shared session fixtures (``prepared_model_dir``, ``prepared_cache_root``, ``llama_model``,
``tokenizer``) live in ``tests/conftest.py`` so the live-agent tests of telemetry, monitoring and
diagnose load the model once per session too; ``HF_HUB_OFFLINE`` is set there, before any import of
transformers. Defining them here again would shadow them and load a second copy.
"""
