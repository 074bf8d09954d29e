"""Model backbones: adapters around diffusers pipelines and tiny local test models."""
