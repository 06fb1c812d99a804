"""What a quantized KV cache costs in answers: the storage formats engines keep K and V in (`ggml`, `fp8`), and
the measurement that runs a real model with its cache passed through them."""
