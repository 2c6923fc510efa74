"""Small plugin modules the host tests load with ``Host.load([...])`` or ``-p``, one defect each."""
