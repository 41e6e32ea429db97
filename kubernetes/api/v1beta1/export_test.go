package v1beta1

// Walk is walk, for the schema tests of package v1beta1_test.
var Walk = walk
