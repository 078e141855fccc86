"""Provider adapters: the only code that talks to APNS, FCM, Twilio, SendGrid (and the sandbox)."""
