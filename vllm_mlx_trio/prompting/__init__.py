"""Chat turns reshaped for the template that renders them (pure: no Trio, no MLX): system and
developer turns a strict template takes, tools for a template that cannot render them."""
