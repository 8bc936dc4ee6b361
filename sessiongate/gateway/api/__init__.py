"""The HTTP surface besides the chat turn: sessions, keys, signals, admin and lifecycle routes, health and models,
the OpenAPI document, and what every request passes through first (middleware, authentication, tenancy, request
schemas, JSON responses)."""
