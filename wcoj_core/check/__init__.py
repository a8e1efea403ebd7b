"""Checks of what the engine made, above everything they check: `verify` reads a whole state
back against its manifests (the primitives of ``wcoj verify``)."""
