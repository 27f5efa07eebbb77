"""Stage 2, image work in plain functions with no Beam in them: sniffing formats
(``formats``), colour management (``colour``), decoding, orienting, resizing and re-encoding
(``prepare``), a memory and time budget per image (``bounds``), and the perceptual hash
(``phash``). Tests and benchmarks call them directly."""

__all__: list[str] = []
