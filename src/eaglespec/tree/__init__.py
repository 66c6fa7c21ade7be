"""Draft trees: specs, growth, flattening, and static trees fitted to a drafter."""
