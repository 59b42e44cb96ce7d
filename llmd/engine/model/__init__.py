"""The model side: torch and transformers live here and nowhere else in llmd."""
