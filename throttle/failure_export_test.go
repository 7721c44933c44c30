package throttle

// ShareForTest exposes share to the external tests.
var ShareForTest = share
