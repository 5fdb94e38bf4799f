"""Tasks (NVCT): the API's domain logic, the scheduler that places and watches them, their views."""
