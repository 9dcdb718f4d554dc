"""What is read off trained models: the offset kernel (spectrum first), probes, and closed forms.

* :mod:`.kernel`: a RoPE head's offset kernel as a spectrum, and every quantity read off it;
* :mod:`.probes`: probes of trained models (equivariance, pinning, head profiles);
* :mod:`.theory`: closed forms (dilution, frequency orbits, the min-norm interpolant).
"""
