"""The scheduler actor: plans steps, delivers outputs, answers control messages."""
