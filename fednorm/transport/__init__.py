"""Byte transports between roles.  They know links and frames, never crypto."""
