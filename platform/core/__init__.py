"""Cross-app plumbing of the control plane: roles, permissions, secrets, strict serializers, health."""
