"""The calc agent written with each agent framework, each run through the agentbolt gateway (see README.md).

One folder per framework (``openai_plain``, ``langgraph``, ``openai_agents``, ``autogen``, ``crewai``), each with
``agent.py`` (the agent: ``calc_agent(task, llm)``), ``requirements.txt`` (its own environment: their pins conflict)
and ``README.md`` (what changed against the framework's plain usage). :mod:`.calc_task` holds what they share.
"""
