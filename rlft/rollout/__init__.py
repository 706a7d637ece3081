"""Rollout: sampling completions and scoring their log-probs."""
