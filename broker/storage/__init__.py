"""SQLite: numbered schema files, named queries, one writer transaction per change. It
persists what the engine decides and never decides itself."""
