"""Rollout samplers: how the group of images for each prompt is generated from a plan."""
