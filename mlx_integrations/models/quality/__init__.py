"""What quantization cost a model: its source and the quantized copy read the same text.

:func:`~mlx_integrations.models.quality.measure.measure_quality` runs both models over a
short built-in English text and returns a
:class:`~mlx_integrations.models.quality.report.QuantizationQuality` (perplexity ratio,
mean KL divergence), whose ``verdict`` and ``warning()`` say whether the quantized model
lost too much. Importing this package loads no MLX.
"""
