"""sandgate brokers: secret sources and credential injectors (see issue on credential brokering)."""
