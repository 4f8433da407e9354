package initcheck

// SentPackets is sentPackets, for the external tests.
var SentPackets = sentPackets
