"""Online chat completions: one Ray Serve deployment per served base, holding the base once with its
fine-tunes' adapters loaded on demand, decoding concurrent requests together (issue 27)."""
