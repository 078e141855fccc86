"""The HTTP API: speaks HTTP only; business rules live in the service modules it calls."""
