package repair

// LabelPatch is labelPatch for the integration tests of package repair_test.
var LabelPatch = labelPatch
