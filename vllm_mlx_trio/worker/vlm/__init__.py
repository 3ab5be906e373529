"""The vision-language runner on mlx-vlm: processor, model wrapper and its cache."""
