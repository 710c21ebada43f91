"""The room-booking agent: one tool over ``data/rooms.json``, 57 real tasks, a plain baseline prompt to optimize."""
