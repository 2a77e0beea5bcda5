"""Webhooks (OpenAI's events, Standard Webhooks signatures): the events, the outbox written with
each job's and batch's end, and the deliverer the controller runs."""
