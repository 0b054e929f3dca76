"""Integrations of attngen's generated backends into other software (no spine code imports
these; each integration uses the families' public runtime classes)."""
