-- Runs once, when the postgres volume is created: Letta's database (POSTGRES_DB=letta) needs
-- pgvector; PromptYoSelf gets a database of its own on the same server.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE DATABASE promptyoself;
