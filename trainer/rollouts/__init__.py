"""rollouts"""
